"""Scan decisions (pure): given listings, what is new, expired, foreign or a work item.

No filesystem, no clock: the engine passes the listing and ``now_ms`` in and carries
out the returned decisions.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from .names import (
    FIELDS_HEAD_PATTERN,
    FsbusFields,
    Kind,
    ParsedName,
    decode_fields,
    decode_topic,
    parse_name,
)

__all__ = [
    "BucketView",
    "Census",
    "Entry",
    "ScanDecision",
    "ScanState",
    "census",
    "decide",
    "is_own_short",
    "long_names",
    "name_order",
    "name_published_ms",
    "name_rank",
    "parse_entry",
    "rank_of",
    "sort_out",
    "split_fresh",
    "sweep_due",
]


class Entry:
    """A parsed message file seen in a bucket (read-only by convention).

    A plain class with ``__slots__`` rather than a frozen dataclass: one is built per
    name listed, and a frozen dataclass's ``__init__`` costs several times as much. For
    the same reason an entry made by a listing (:func:`parse_entry`) holds what a scan
    needs (kind, expiry, rank) and takes its name apart whole (:attr:`parsed`) only when
    asked: a queue's first listing may hold tens of thousands, most of them claimed
    long after."""

    __slots__ = (
        "_parsed",
        "bucket_index",
        "expires_ms",
        "fields",
        "key",
        "kind",
        "name",
        "rank",
        "topic",
    )

    _parsed: ParsedName | None
    bucket_index: int
    """Index of its bucket."""
    name: str
    """The file name."""
    kind: Kind
    """``m`` multi, ``s`` single, ``d`` direct (qlobber-fsq only)."""
    expires_ms: int
    """Expiry, milliseconds since the epoch."""
    fields: FsbusFields | None
    """fsbus's fields when an fsbus peer wrote the name, else None."""
    topic: str | None
    """The decoded topic, or None while a long topic's spill is not read yet."""
    key: tuple[int, str]
    """(bucket index, name): unique on the bus (computed once: it is used per scan)."""
    rank: int
    """Sort key, lower first: priority, then publish time, then the publisher's sequence
    (FIFO), packed into one integer so that comparing two is one operation.

    Names from qlobber-fsq peers carry no priority or publish time: they sort by expiry
    at the default priority (and among equals in the order they were seen)."""

    def __init__(self, bucket_index: int, parsed: ParsedName, topic: str | None) -> None:
        self.bucket_index = bucket_index
        self._parsed = parsed
        self.name = parsed.name
        self.kind = parsed.kind
        self.expires_ms = parsed.expires_ms
        self.fields = parsed.fields
        self.topic = topic
        self.key = (bucket_index, parsed.name)
        self.rank = rank_of(parsed)

    @property
    def parsed(self) -> ParsedName:
        """Its name taken apart."""
        p = self._parsed
        if p is None:
            p = parse_name(self.name)
            assert p is not None  # (it was parsed as a message's name once)
            self._parsed = p
        return p

    def __repr__(self) -> str:
        return f"Entry({self.bucket_index!r}, {self.parsed!r}, {self.topic!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Entry):
            return NotImplemented
        return (self.bucket_index, self.parsed, self.topic) == (
            other.bucket_index,
            other.parsed,
            other.topic,
        )

    def __hash__(self) -> int:
        return hash((self.bucket_index, self.parsed, self.topic))

    @property
    def priority(self) -> int:
        """The work-queue priority (the default one for qlobber-fsq's names)."""
        return self.rank >> 184


_rank = operator.attrgetter("rank")


def name_rank(name: str) -> int:
    """The :attr:`Entry.rank` of a message name (one :func:`parse_name` would take),
    from fsbus's fields without parsing the rest of it."""
    unique = name[name.rfind("+") + 1 :]
    f = decode_fields(unique)
    if f is None:
        parsed = parse_name(name)
        return 0 if parsed is None else rank_of(parsed)
    return (f.priority << 184) | (f.published_ms << 128) | int(unique[-12:], 16)


def name_order(name: str) -> str:
    """A sort key of a message name in :func:`name_rank`'s order (both fixed-width hex:
    the same order), cut from fsbus's fields without decoding them: a third of its cost,
    for ordering a whole queue to take its head."""
    unique = name[name.rfind("+") + 1 :]
    if len(unique) == 34 and unique[0] == "f" and unique[1] == "1":
        # f1, flags (1), priority (2), published (11), host (6), sequence (12)
        return unique[3:16] + unique[-12:]
    rank = name_rank(name)
    return f"{rank >> 184:02x}{(rank >> 128) & _PUBLISHED:011x}{rank & _SEQUENCE:012x}"


def name_published_ms(name: str) -> int | None:
    """When an fsbus publisher named message ``name`` (its wall clock, in ms); None
    for a name of qlobber-fsq's, which tells no publish time."""
    unique = name[name.rfind("+") + 1 :]
    if len(unique) == 34 and unique[0] == "f" and unique[1] == "1":
        # f1, flags (1), priority (2), published (11), host (6), sequence (12)
        try:
            return int(unique[5:16], 16)
        except ValueError:
            return None
    f = decode_fields(unique)
    return None if f is None else f.published_ms


def split_fresh(entries: Iterable[Entry], horizon_ms: int) -> tuple[list[Entry], list[Entry]]:
    """``entries`` split into those published before ``horizon_ms`` (or of unknown
    publish time) and those published at or after it.

    A listing that began at ``horizon_ms`` (read UPDATE, then listed the buckets one
    after the other) may have missed a message that a publisher renamed into a bucket
    it had listed already, and seen a later one of the same publisher in a bucket listed
    after: that later one was published after the listing began. A message published
    before it began was published after the publisher's earlier messages were renamed
    into their buckets and stamped, so the listing, or an earlier one, saw those.
    Taking only messages published before the listing began keeps each publisher's
    order; the others wait for the next listing, which sees whatever came before them.
    """
    before: list[Entry] = []
    after: list[Entry] = []
    for e in entries:
        f = e.fields
        (after if f is not None and f.published_ms >= horizon_ms else before).append(e)
    return before, after


_PUBLISHED: Final = (1 << 56) - 1
_SEQUENCE: Final = (1 << 48) - 1


def rank_of(parsed: ParsedName) -> int:
    """The :attr:`Entry.rank` of a name (without building the entry)."""
    f = parsed.fields
    if f is None:
        return (50 << 184) | (parsed.expires_ms << 128)
    return (f.priority << 184) | (f.published_ms << 128) | int(parsed.unique[-12:], 16)


BAD_SPILL: Final = "\x00"
"""What `BusFS.read_spills` gives for a spill that can never hold a topic (not
ASCII, a symlink, not a regular file): the message is foreign."""


@dataclass
class BucketView:
    """What the last listing of one bucket held, sorted out (kept between scans)."""

    multis: dict[str, Entry] = field(default_factory=dict)
    """Unexpired multi messages, by name."""
    singles: dict[str, Entry] = field(default_factory=dict)
    """Unexpired single messages, by name."""
    expired: dict[str, Entry] = field(default_factory=dict)
    """Messages past their expiry still present, by name."""
    foreign: set[str] = field(default_factory=set)
    """Names that are not messages."""
    unparsed: set[str] = field(default_factory=set)
    """fsbus's own short names, left unparsed by a listing for peers' messages only
    (:func:`decide`'s ``peers_only``); sorted out by the first listing that is not."""
    next_expiry: int = 0
    """The soonest expiry among :attr:`multis` and :attr:`singles` (0: none)."""

    def drop(self, name: str) -> None:
        """Forget a name that left the bucket."""
        self.multis.pop(name, None)
        self.singles.pop(name, None)
        self.expired.pop(name, None)
        self.foreign.discard(name)
        self.unparsed.discard(name)

    def place(self, name: str, entry: Entry, now_ms: int) -> str | None:
        """Keep a message's ``entry`` where it belongs: ``"expired"``, ``"s"`` (a single)
        or ``"m"`` (a multi), which it returns; None for a kind it does not keep."""
        expires_ms = entry.expires_ms
        if expires_ms <= now_ms:
            self.expired[name] = entry
            return "expired"
        kind = entry.kind
        if kind == "s":
            self.singles[name] = entry
        elif kind == "m":
            self.multis[name] = entry
        else:
            return None
        if self.next_expiry == 0 or expires_ms < self.next_expiry:
            self.next_expiry = expires_ms
        return kind

    def expire(self, now_ms: int) -> None:
        """Move what expired by ``now_ms`` to :attr:`expired`."""
        soonest = 0
        for live in (self.multis, self.singles):
            for name, e in list(live.items()):
                t = e.expires_ms
                if t <= now_ms:
                    del live[name]
                    self.expired[name] = e
                elif soonest == 0 or t < soonest:
                    soonest = t
        self.next_expiry = soonest


@dataclass
class ScanState:
    """What the engine remembers between scans."""

    seen: dict[int, set[str]] = field(default_factory=dict)
    """Bucket index -> names in its previous listing."""
    parsed: dict[tuple[int, str], Entry | None] = field(default_factory=dict)
    """Cache of parsed names (None: foreign) for names still present."""
    buckets: dict[int, BucketView] = field(default_factory=dict)
    """Bucket index -> its previous listing sorted out (only names that changed are
    looked at again, and expiries only once the soonest one is due)."""


@dataclass
class ScanDecision:
    """What to do after one round of listings."""

    new_multi: list[Entry] = field(default_factory=list)
    """Multi messages not seen in the previous listing (deliver)."""
    present_multi: list[Entry] = field(default_factory=list)
    """Every unexpired multi message present (for subscribers asking for existing ones)."""
    singles: list[Entry] = field(default_factory=list)
    """Every unexpired single message present (work items to try to claim), in no
    particular order: the engine's heap orders them by :attr:`Entry.rank`."""
    new_singles: list[Entry] = field(default_factory=list)
    """Those of :attr:`singles` not in the previous listing (also on a baseline)."""
    expired: list[Entry] = field(default_factory=list)
    """Messages past their expiry (delete)."""
    foreign: list[tuple[int, str]] = field(default_factory=list)
    """Names that are not messages (quarantine)."""
    need_spill: list[tuple[int, str]] = field(default_factory=list)
    """Long messages whose topic spill must be read before they can be matched."""
    unparsed: int = 0
    """How many names of the listed buckets are fsbus's own, left unparsed
    (``peers_only``)."""
    new_unparsed: list[tuple[int, str]] = field(default_factory=list)
    """Those of them not in the previous listing (bucket index, name)."""


def decide(
    state: ScanState,
    listings: dict[int, list[str]],
    spills: dict[tuple[int, str], str | None],
    now_ms: int,
    *,
    baseline: bool = False,
    peers_only: bool = False,
    cut: tuple[Collection[int], int] | None = None,
) -> ScanDecision:
    """Compare listings with the previous ones and sort every name into a decision.

    ``baseline`` marks the first listing of a bucket set: nothing in it counts as new.
    ``spills`` maps long names to their spilled topic rest (None: the spill file was
    missing). Long names absent from ``spills`` are listed in ``need_spill``; neither kind
    is marked as seen, so they are looked at again next round.

    ``peers_only``: the listing looks for qlobber-fsq peers' messages only (a bus that
    only routes them into queues), so fsbus's own short names are not parsed: they are
    kept in :attr:`BucketView.unparsed` (counted in :attr:`ScanDecision.unparsed`, the
    new ones listed), and the first listing without ``peers_only`` sorts them out as
    present, not new.

    ``cut``: (buckets, ms): in these buckets, a multi message published (its name says
    when) before that time is present, not new: buckets a router passed over by their
    stamps, whose last listing is older than the subscription that came since.

    Only the names that came or went since a bucket's previous listing are looked at one
    by one; the rest of the decision comes from what that listing was sorted into.
    """
    out = ScanDecision()
    parsed = state.parsed
    for bi, names in listings.items():
        prev = state.seen.get(bi)
        view = state.buckets.get(bi)
        current = set(names)
        if prev is None or view is None:
            view = state.buckets[bi] = BucketView()
            added: list[str] | set[str] = names
        else:
            for gone in prev - current:
                parsed.pop((bi, gone), None)
                view.drop(gone)
            added = current - prev
            if view.unparsed and not peers_only:
                # present since a listing for peers only: sorted out now, none new
                sort_out(view, bi, view.unparsed, now_ms)
                view.unparsed = set()
        keep_unseen: set[str] = set()
        for name in added:
            if peers_only and is_own_short(name):
                view.unparsed.add(name)
                if not baseline:
                    out.new_unparsed.append((bi, name))
                continue
            key = (bi, name)
            if key in parsed:
                entry = parsed[key]
            else:
                entry = parse_entry(bi, name, spills)
                if entry is not None and entry.topic is None:
                    # The spill is not read yet, or was missing: try again next listing.
                    if key not in spills:
                        out.need_spill.append(key)
                    keep_unseen.add(name)
                    continue
                parsed[key] = entry
            if entry is None:
                view.foreign.add(name)
                continue
            placed = view.place(name, entry, now_ms)
            if placed == "s":
                out.new_singles.append(entry)
            elif placed == "m" and not baseline:
                if (
                    cut is None
                    or bi not in cut[0]
                    or entry.fields is None
                    or entry.fields.published_ms >= cut[1]
                ):
                    out.new_multi.append(entry)
        out.unparsed += len(view.unparsed)
        if view.next_expiry and view.next_expiry <= now_ms:
            view.expire(now_ms)  # only names seen before can expire here
        out.singles.extend(view.singles.values())
        out.present_multi.extend(view.multis.values())
        out.expired.extend(view.expired.values())
        out.foreign.extend((bi, name) for name in view.foreign)
        state.seen[bi] = current - keep_unseen if keep_unseen else current
    out.new_multi.sort(key=_rank)
    # singles need no sort here: the engine keeps them in a priority heap
    return out


def is_own_short(name: str) -> bool:
    """Whether ``name`` has fsbus's unique part (``f1`` and 32 more characters, where a
    qlobber-fsq peer's has 32 and a kind letter before its ``+``) and a short topic."""
    return len(name) > 38 and name[-35] == "+" and name[-34:-32] == "f1" and "@s+" in name


def sort_out(view: BucketView, bi: int, names: Iterable[str], now_ms: int) -> list[Entry]:
    """Parse short ``names`` of bucket ``bi`` into ``view`` as present (not new); their
    entries (messages only), for a caller that counts them as new after all."""
    out = []
    for name in names:
        entry = parse_entry(bi, name, {})
        if entry is None or entry.topic is None:
            view.foreign.add(name)
            continue
        out.append(entry)
        view.place(name, entry, now_ms)
    return out


def long_names(state: ScanState, listings: dict[int, list[str]]) -> list[tuple[int, str]]:
    """Long-topic names not parsed yet: their spills must be read before :func:`decide`."""
    out = []
    for bi, names in listings.items():
        for name in names:
            if "@l+" in name and (bi, name) not in state.parsed:
                out.append((bi, name))
    return out


def parse_entry(bi: int, name: str, spills: dict[tuple[int, str], str | None]) -> Entry | None:
    """The entry of ``name`` in bucket ``bi`` (``spills``: long topics' rests, as read by
    :meth:`BusFS.read_spills`); None when it is not a message's name."""
    m = _OWN_SHORT_RE.fullmatch(name)
    if m is not None:
        # fsbus's own name with its whole topic in it (nearly every name): what a scan
        # needs, from one match; the rest is parsed when asked for (Entry.parsed).
        topic_hex, expires, kind, flags, priority, published, host, sequence = m.groups()
        topic = _topics.get(topic_hex)
        if topic is None:
            topic = decode_topic(topic_hex)
            if topic is None:
                return None
            if len(_topics) >= 4096:
                _topics.clear()
            _topics[topic_hex] = topic
        e = _new_entry(Entry)
        e.bucket_index = bi
        e._parsed = None
        e.name = name
        e.kind = kind  # type: ignore[assignment]
        e.expires_ms = int(expires, 16)
        f = e.fields = FsbusFields(int(flags, 16), int(priority, 16), int(published, 16), host)
        e.topic = topic
        e.key = (bi, name)
        e.rank = (f.priority << 184) | (f.published_ms << 128) | int(sequence, 16)
        return e
    parsed = parse_name(name)
    if parsed is None:
        return None
    if parsed.long:
        rest = spills.get((bi, name))
        if rest is None:
            return Entry(bi, parsed, None)
        if rest == BAD_SPILL:
            return None  # foreign: quarantined once, never read again
        topic = decode_topic(parsed.topic_hex + rest)
        if topic is None:
            return None
        return Entry(bi, parsed, topic)
    topic = decode_topic(parsed.topic_hex)
    if topic is None:
        return None
    return Entry(bi, parsed, topic)


_SHORT_HEAD: Final = r"((?:[0-9a-f]{2})*)@s\+([0-9a-f]{1,13})\+([msd])\+"
"""A short name (the whole hex topic in it) up to its unique part, as parse_name reads
it: the topic, expiry and kind."""
# fsbus's own short name, as parse_name takes it apart: then the unique part's flags,
# priority, publish time, host and sequence.
_OWN_SHORT_RE: Final = re.compile(_SHORT_HEAD + FIELDS_HEAD_PATTERN + "([0-9a-f]{12})", re.DOTALL)
_topics: dict[str, str] = {}
"""Hex topics decoded by :func:`parse_entry` (a bus holds few distinct topics)."""
_new_entry = object.__new__


SWEEPS_PER_AGE: Final = 10
"""On shared mounts, crash debris is swept this many times per ``debris_age``."""


def sweep_due(now: float, last: float | None, *, max_age: float, shared: bool) -> bool:
    """Whether a garbage collection also sweeps crash debris now (pure).

    A sweep lists every bucket of five folders (1,280 listings with 256 buckets) and
    looks at every message present. Locally that is cheap and done at each collection.
    On a network mount each listing is a round trip to a server, and debris need only
    go once it is ``max_age`` seconds old: sweep every ``max_age / 10`` seconds there
    (the debris goes by 1.1 x ``max_age``). ``max_age`` is the shortest age that
    counts (pass the claim lease where claims are renamed). ``last`` is the time of
    the last sweep (None: never); a clock that went back sweeps at once.
    """
    if not shared or last is None:
        return True
    since = now - last
    return since < 0 or since >= max_age / SWEEPS_PER_AGE


# A short name: the rest of the name is not looked at (no "@" or "+" in it).
_SHORT_NAME_RE: Final = re.compile(_SHORT_HEAD + "[^@+]*", re.DOTALL)


class Census(NamedTuple):
    """Every name of a set of full listings sorted out, without an :class:`Entry` each.

    What :func:`decide` would say on a first listing (``baseline``) about the same names,
    for the short names it takes apart itself; ``rest`` holds the others (long topics,
    whose spill must be read, and names that are not of the short form), to go through
    :func:`decide`."""

    singles: list[tuple[int, str]]
    """Unexpired single messages, (bucket index, name)."""
    multis: int
    """How many unexpired multi messages."""
    expired: list[tuple[int, str, str]]
    """Messages past their expiry, (bucket index, name, kind)."""
    foreign: list[tuple[int, str]]
    """Short names whose topic is not hex of UTF-8: not messages."""
    rest: dict[int, list[str]]
    """The names left for :func:`decide`, by bucket index."""


def soonest_expiry_ms(names: Iterable[str]) -> int | None:
    """The soonest expiry (ms) that fsbus's short names among ``names`` tell (pure);
    None when none does."""
    match = _SHORT_NAME_RE.fullmatch
    soonest: int | None = None
    for name in names:
        m = match(name)
        if m is not None:
            at = int(m.group(2), 16)
            if soonest is None or at < soonest:
                soonest = at
    return soonest


def census(
    listings: dict[int, list[str]], now_ms: int, topics: dict[str, bool] | None = None
) -> Census:
    """Sort out full listings for a count or an expiry sweep (pure).

    One regular-expression match per name and no object built for it: a tenth of
    :func:`decide`'s cost per name, for a queue or a bus of many thousands that is
    counted or swept as a whole. ``topics`` caches whether a hex topic decodes (pass the
    same dict again to keep it).
    """
    ok_topic = {} if topics is None else topics
    match = _SHORT_NAME_RE.fullmatch
    singles: list[tuple[int, str]] = []
    expired: list[tuple[int, str, str]] = []
    foreign: list[tuple[int, str]] = []
    rest: dict[int, list[str]] = {}
    multis = 0
    for bi, names in listings.items():
        for name in names:
            m = match(name)
            if m is None:
                rest.setdefault(bi, []).append(name)
                continue
            topic_hex, expires, kind = m.groups()
            ok = ok_topic.get(topic_hex)
            if ok is None:
                if len(ok_topic) >= 4096:
                    ok_topic.clear()
                ok = ok_topic[topic_hex] = decode_topic(topic_hex) is not None
            if not ok:
                foreign.append((bi, name))
            elif int(expires, 16) <= now_ms:
                expired.append((bi, name, kind))
            elif kind == "s":
                singles.append((bi, name))
            elif kind == "m":
                multis += 1
    return Census(singles, multis, expired, foreign, rest)
